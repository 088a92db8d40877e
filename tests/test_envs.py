"""tools/envs.py on the CPU, without a network or a new environment: the names it takes from
harness.spec, the requirements and lock it picks, the host-provided filter, the stamp it writes and
the kernel it installs (commands recorded, not run)."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness import provenance, spec

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "envs.py"
HOST = "h200-cuda-image"


def load_envs() -> ModuleType:
    module_spec = importlib.util.spec_from_file_location("envs_tool", SCRIPT)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture
def envs() -> ModuleType:
    return load_envs()


@pytest.fixture
def checkout(tmp_path, monkeypatch, envs):
    """A copy of envs/ in a scratch checkout, with commands recorded instead of run."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "envs", root / "envs")
    monkeypatch.setattr(envs, "ROOT", root)
    monkeypatch.setattr(envs, "ENVS", root / "envs")
    monkeypatch.setattr(envs, "VENVS", root / ".venvs")
    monkeypatch.setattr(envs, "HOSTS", root / "envs" / "hosts")
    monkeypatch.setattr(envs, "user_kernel_dir", lambda: tmp_path / "user" / "kernels")
    commands: list[list[str]] = []
    monkeypatch.setattr(envs, "run", lambda command, **kwargs: commands.append([str(part) for part in command]))
    envs.commands = commands
    return root


def bare_python(*args: str) -> subprocess.CompletedProcess[str]:
    """tools/envs.py under this interpreter without site-packages (-S) or the environment (-I)."""
    return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], capture_output=True, text=True, cwd="/")


def create(envs: ModuleType, name: str, **options: object) -> None:
    """``envs.py create NAME`` with the recorded commands: only the stamp is written, into the folder
    ``python -m venv`` would have made."""
    args = argparse.Namespace(name=name, torch="cpu", wheelhouse=None, fresh=False, no_kernel=False, host=None)
    vars(args).update(options)
    (envs.VENVS / name).mkdir(parents=True, exist_ok=True)
    envs.create(args)


def test_environment_and_kernel_names_come_from_the_spec(envs):
    assert tuple(spec.ENVIRONMENTS) == envs.ENVIRONMENTS
    assert {name: env.kernel for name, env in spec.ENVIRONMENTS.items() if env.kernel is not None} == envs.KERNELS
    assert "replay" in envs.ENVIRONMENTS and "replay" not in envs.KERNELS
    for stack in spec.STACKS.values():  # every notebook's kernel is one an environment installs
        assert envs.KERNELS[stack.environment] == stack.kernel
    for name in envs.ENVIRONMENTS:  # and every environment the spec names has its files
        assert (ROOT / "envs" / name / "requirements.in").is_file() and (ROOT / "envs" / name / "constraints.txt").is_file()


def test_help_runs_on_a_bare_python():
    completed = bare_python("--help")
    assert completed.returncode == 0, completed.stderr
    for command in ("create", "lock", "wheelhouse", "stamp", "kernel"):
        assert command in completed.stdout


def test_create_refuses_an_unknown_environment_by_name():
    completed = bare_python("create", "pylate15")
    assert completed.returncode == 2
    assert "unknown environment 'pylate15' (did you mean 'pylate-1.5'?)" in completed.stderr
    assert f"choose one of {', '.join(spec.ENVIRONMENTS)}" in completed.stderr


def test_env_dir_refuses_an_unknown_environment(envs):
    with pytest.raises(SystemExit, match="unknown environment 'nope'; choose one of colpali"):
        envs.env_dir("nope")


@pytest.mark.parametrize("line", [
    "torch==2.13.0", "torch", "Torch[opt]==2.13.0", "torchvision==0.29.1 ; sys_platform == 'linux'", "torchaudio==2.13.0",
    "triton==3.6.0", "triton==3.6.0; platform_machine == 'x86_64'", "nvidia-cublas-cu12==12.8.4.1", "nvidia-nccl-cu13==2.28.3",
    "cuda-bindings==12.9.4", "setuptools==80.9.0",
])  # fmt: skip
def test_host_provided_lines_are_left_out_of_locks(envs, line):
    assert envs.HOST_PROVIDED.match(line)


@pytest.mark.parametrize("line", [
    "torchmetrics==1.8.2", "tritonclient==2.60.0", "transformers==5.3.0", "pynvml==12.0.0", "setuptools-scm==9.2.0",
    "sentence-transformers==5.3.0",
])  # fmt: skip
def test_other_lines_stay_in_locks(envs, line):
    assert not envs.HOST_PROVIDED.match(line)


def test_no_committed_lock_pins_what_the_host_provides(envs):
    locks = sorted((ROOT / "envs").glob("*/constraints*.txt"))
    assert len(locks) >= 2 * len(envs.ENVIRONMENTS)
    for lock in locks:
        assert not [line for line in envs.read_lines(lock) if envs.HOST_PROVIDED.match(line)], lock


def test_requirements_and_lock_without_a_host(checkout, envs):
    folder = checkout / "envs" / "pylate"
    assert envs.requirements_file("pylate", None) == folder / "requirements.in"
    assert envs.constraints_file("pylate", None) == folder / "constraints.txt"
    assert not list(folder.glob(".requirements.*"))


def test_a_host_gets_its_own_lock_and_no_book_layer(checkout, envs):
    folder = checkout / "envs" / "pylate"
    assert envs.constraints_file("pylate", HOST) == folder / f"constraints.{HOST}.txt"
    requirements = envs.requirements_file("pylate", HOST)
    assert requirements == folder / f".requirements.{HOST}.in"  # beside the original: `-r ../common.in` resolves
    original = (folder / "requirements.in").read_text().splitlines()
    assert envs.REPORT_LAYER in [line.strip() for line in original]
    assert requirements.read_text().splitlines() == [line for line in original if line.strip() != envs.REPORT_LAYER]


def test_every_environment_has_a_lock_for_every_known_host(envs):
    hosts = [path.stem for path in (ROOT / "envs" / "hosts").glob("*.txt")]
    assert HOST in hosts
    for name in envs.ENVIRONMENTS:
        for host in hosts:
            assert envs.constraints_file(name, host).is_file()


def test_the_stamp_names_the_environment_and_its_lock(tmp_path, envs):
    lock = ROOT / "envs" / "pylate" / "constraints.txt"
    path = envs.write_stamp("pylate", lock, tmp_path)
    assert envs.STAMP == provenance.ENVIRONMENT_STAMP and path == tmp_path / provenance.ENVIRONMENT_STAMP
    stamp = json.loads(path.read_text())
    assert stamp == {
        "environment": "pylate",
        "lock_file": "envs/pylate/constraints.txt",
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
    }
    assert provenance.environment_stamp(tmp_path) == stamp  # what every result records


def test_the_stamp_command_needs_an_existing_environment(checkout, envs, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["envs.py", "stamp", "pylate-1.5"])
    with pytest.raises(SystemExit, match="no environment at .*pylate-1.5; create it first"):
        envs.main()
    python = checkout / ".venvs" / "pylate-1.5" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    monkeypatch.setattr(sys, "argv", ["envs.py", "stamp", "pylate-1.5", "--host", HOST])
    envs.main()
    stamp = json.loads((checkout / ".venvs" / "pylate-1.5" / envs.STAMP).read_text())
    assert stamp["lock_file"] == f"envs/pylate-1.5/constraints.{HOST}.txt"


def test_create_installs_the_kernel_into_the_environment_and_stamps_it(checkout, envs):
    create(envs, "pylate")
    venv = checkout / ".venvs" / "pylate"
    lock = checkout / "envs" / "pylate" / "constraints.txt"
    install = next(command for command in envs.commands if "-c" in command)
    assert install[install.index("-c") + 1] == str(lock)
    assert install[install.index("-r") + 1] == str(checkout / "envs" / "pylate" / "requirements.in")
    (kernel,) = [command for command in envs.commands if "ipykernel" in command]
    assert kernel[0] == str(venv / "bin" / "python") and "--user" not in kernel
    assert kernel[kernel.index("--prefix") + 1] == str(venv) and kernel[kernel.index("--name") + 1] == "maxsim-pylate"
    stamp = json.loads((venv / envs.STAMP).read_text())
    assert stamp == {"environment": "pylate", "lock_file": "envs/pylate/constraints.txt",
                     "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}  # fmt: skip


def test_create_on_a_known_host_uses_and_stamps_its_lock(checkout, envs):
    create(envs, "colpali", host=HOST)
    install = next(command for command in envs.commands if "-c" in command)
    assert install[install.index("-c") + 1].endswith(f"envs/colpali/constraints.{HOST}.txt")
    assert install[install.index("-r") + 1].endswith(f"envs/colpali/.requirements.{HOST}.in")
    stamp = json.loads((checkout / ".venvs" / "colpali" / envs.STAMP).read_text())
    assert stamp["lock_file"] == f"envs/colpali/constraints.{HOST}.txt"


@pytest.mark.parametrize("name, options", [("replay", {}), ("pylate", {"no_kernel": True})])
def test_no_kernel_where_none_is_wanted(checkout, envs, name, options):
    create(envs, name, **options)
    assert not [command for command in envs.commands if "ipykernel" in command]
    assert (checkout / ".venvs" / name / envs.STAMP).is_file()


def test_only_this_checkouts_old_per_user_kernels_are_removed(tmp_path, checkout, envs):
    user = tmp_path / "user" / "kernels"
    for name, python in [("maxsim-pylate", checkout / ".venvs" / "pylate" / "bin" / "python"),
                         ("maxsim-colpali", tmp_path / "other-checkout" / ".venvs" / "colpali" / "bin" / "python")]:  # fmt: skip
        (user / name).mkdir(parents=True)
        (user / name / "kernel.json").write_text(json.dumps({"argv": [str(python), "-m", "ipykernel_launcher"]}))
    envs.install_kernel("pylate")
    envs.install_kernel("colpali")
    assert not (user / "maxsim-pylate").exists()  # ours, from before kernels lived in the environments
    assert (user / "maxsim-colpali" / "kernel.json").is_file()  # another checkout's: left alone


def test_this_environments_kernel_runs_its_own_python_by_absolute_path():
    prefix = Path(sys.prefix)
    if prefix.parent != ROOT / ".venvs" or spec.ENVIRONMENTS.get(prefix.name) is None:
        pytest.skip("not running in one of this checkout's .venvs environments")
    kernel = spec.ENVIRONMENTS[prefix.name].kernel
    if kernel is None:
        pytest.skip(f"the {prefix.name} environment has no kernel")
    kernel_json = prefix / "share" / "jupyter" / "kernels" / kernel / "kernel.json"
    assert kernel_json.is_file(), f"run `python tools/envs.py kernel {prefix.name}`"
    python = Path(json.loads(kernel_json.read_text())["argv"][0])
    assert python.is_absolute() and python == prefix / "bin" / "python"
    stamp = provenance.environment_stamp(prefix)
    assert stamp.get("environment") == prefix.name, f"run `python tools/envs.py stamp {prefix.name}`"
