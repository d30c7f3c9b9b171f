import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def walks():
    from agents.ilql.tasks.randomwalks import RandomWalks

    return RandomWalks()


@pytest.fixture(scope="session")
def walk_data(walks):
    from agents.ilql.data import episodes_to_arrays

    return episodes_to_arrays(walks.episodes(), walks.max_tokens, walks.max_actions)


TINY = {"vocab_size": 22, "block_size": 16, "n_layer": 2, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64,
        "min_layers": 1, "max_layers": 4}
