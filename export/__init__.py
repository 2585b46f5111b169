"""Trajectories out to trainers and viewers: Parquet, JSON lines, Harbor's ATIF."""
