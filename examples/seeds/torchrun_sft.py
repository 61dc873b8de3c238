# Ported from the Twinkle "Runtime Modes" document, section "torchrun Mode", whose train() is "Same training code as
# single GPU": it runs that section's listing (examples/seeds/single_process_sft.py, imported). Substitutions,
# nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - GPU counts -> CPU ranks: fsdp_size=4, dp_size=2 (8 GPUs) -> fsdp_size=2, dp_size=1 (2 CPU ranks).
# Launch: torchrun --nproc_per_node=2 examples/seeds/torchrun_sft.py
import single_process_sft  # the "Single GPU" listing of the same document, beside this file

import twinkle_core as twinkle
from twinkle_core import DeviceMesh

# Construct device mesh: FSDP=2, DP=1
device_mesh = DeviceMesh.from_sizes(fsdp_size=2, dp_size=1)

# Initialize in local mode
twinkle.initialize(mode='local', global_device_mesh=device_mesh)


def train():
    # Same training code as single GPU
    single_process_sft.train()


if __name__ == '__main__':
    train()
