"""Suite-wide settings."""

import torch

# Tests share two cores with the subprocesses they start (Ray nodes, specd, CLI runs); one
# intra-op thread avoids oversubscription, which slows tiny-model passes down several times.
torch.set_num_threads(1)
