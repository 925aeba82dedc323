"""What the PyTorch training benchmarks share (scripts/bench_hf_llama.py,
scripts/bench_torch_llama.py): lowbit's model presets and the timing of a training step."""
import time

import torch

# hidden, intermediate, heads, layers (crates/model/src/config.rs)
PRESETS = {"llama20m": (256, 688, 4, 4), "llama60m": (512, 1376, 8, 8), "llama100m": (640, 1708, 10, 12),
           "llama130m": (768, 2048, 12, 12), "llama350m": (1024, 2736, 16, 24)}


def timed(step, steps, warmup=3):
    """Seconds for `steps` calls of `step` after `warmup` untimed ones (the GPU synchronised at
    both ends), and the peak GPU memory of the timed calls in GiB."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return time.perf_counter() - t, torch.cuda.max_memory_allocated() / 2**30
