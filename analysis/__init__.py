"""Reading a rollout's record: token chains, drift, turns, steps, actions, reward-hack detectors."""
