"""What a GPU test of an engine entry checks of its calls: the kernels they launch, run after one
warm-up call each (loads and layouts done), with torch's sync debug mode raising on a host sync."""
import torch


def kernels_launched(calls) -> list[str]:
    """The names of the CUDA kernels ``calls`` (functions of no arguments) launch, in order."""
    for call in calls:
        call()  # load once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for call in calls:
                call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
