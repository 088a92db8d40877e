"""Running cells: the worker pool and GPU gates (``pool``), one papermill launch per cell with its
failure read from the executed notebook (``launcher``), grids (``sweep``) and ceiling searches
(``ceiling``). Nothing here imports torch: cells run in their own kernels."""
