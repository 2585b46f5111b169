"""Dockerfiles that install each harness on top of a task image (package data of rolltap)."""
