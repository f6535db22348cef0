"""The fault-injection suite (issue 18 item 4): `python -m sglang_pdd.lab.faults`.

One PDD deployment on the netns WAN testbed (P and RLD in cluster A, two MDs in cluster B, the
router in A), a single plain server as the token reference; each scenario runs concurrent multi-turn
conversations, injects one fault at an observable moment and classifies every request
(`outcome`). docs/faults.md lists the scenarios and their expected outcomes.
"""
