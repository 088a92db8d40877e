# Sourced by the device scripts (tools/device_*.sh): `device_envs LOGDIR` creates both stack
# environments offline from ./wheelhouse for the host image $HOST_IMAGE (default h200-cuda-image),
# once per machine (a marker in each environment), logging to LOGDIR/envs-<env>.log; on failure it
# prints the log's tail and returns 1.
device_envs() {
  local logs=$1 env host=${HOST_IMAGE:-h200-cuda-image}
  for env in pylate colpali; do
    [ -f ".venvs/$env/.device-ready" ] && continue
    python3 tools/envs.py create "$env" --torch system --host "$host" --wheelhouse wheelhouse > "$logs/envs-$env.log" 2>&1 \
      || { tail -20 "$logs/envs-$env.log"; return 1; }
    touch ".venvs/$env/.device-ready"
  done
}
