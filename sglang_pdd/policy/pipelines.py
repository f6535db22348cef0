"""Pipeline: the chains of roles a request can take, P->MD, P->RLD->MD and P->RLD.

Its own module because both choices name it: the pipeline policy (`policy.pipeline`) and the
never-lose decision it consults (`policy.never_lose`); the room plan, the router and the simulator
read it too.
"""

from __future__ import annotations

import enum


class Pipeline(str, enum.Enum):
    P_MD = "P->MD"
    P_RLD_MD = "P->RLD->MD"
    P_RLD = "P->RLD"
