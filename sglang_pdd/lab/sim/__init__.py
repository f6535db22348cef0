"""Cluster simulator for PDD at datacenter scale: P, RLD and MD pools, the WAN, cost and BCR.

Run `python -m sglang_pdd.lab.sim --help`. The model and every assumption are in docs/sim.md.
Importing this package imports no submodule.
"""
