import torch

# like the schedulers' workers: one intra-op thread (2+ stall tight loops on small shared machines)
torch.set_num_threads(1)
