"""The torch-facing ops: argument checks, the choice of kernel and grid, the CPU (torch)
paths, and their torch.library registration. One file per op; see docs/architecture.md."""
