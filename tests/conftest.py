import torch

# Two threads on the 2-core CI machine; the tests are small and more threads only add noise.
torch.set_num_threads(min(torch.get_num_threads(), 2))
