"""Training: data lanes, the training loop, evaluation against Markov baselines."""
