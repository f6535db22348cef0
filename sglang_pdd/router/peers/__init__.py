"""The router's peers: the pools of P, RLD and MD servers (`pool`), their health, probes and
readiness, the load and bandwidth feeds read from their /metrics, where a request goes
(`placement`), and how the router talks to them (`upstream`, `role_auth`)."""
