"""StepOrder: prefill first, one relay decode step after each prefill step; sglang's chunk bookkeeping sees
the last prefill batch, never the relay's. Plans and batches are labels (the real loop: test_local_relay)."""

from types import SimpleNamespace

from sglang_pdd.prefill_relay.step_order import StepOrder


def run(order, prefills, steps, n):
    """n iterations of the loop; `prefills`/`steps`: what sglang / the relay would run next (None: nothing).
    Returns what ran and the last batch each prefill call was given."""
    ran, given, last = [], [], None
    prefills, steps = list(prefills), list(steps)

    def prefill(last_batch):
        given.append(last_batch)
        return SimpleNamespace(batch_to_run=prefills.pop(0) if prefills else None, running_batch="rb")

    def step():
        return steps.pop(0) if steps else None

    for _ in range(n):
        plan, batch = order.next(prefill, step, last)
        last = batch if batch is not None else plan.batch_to_run
        ran.append(last)
    return ran, given


def test_prefill_and_relay_steps_alternate_while_both_have_work():
    ran, given = run(StepOrder(), ["P1", "P2", "P3"], ["D1", "D2", "D3"], 6)
    assert ran == ["P1", "D1", "P2", "D2", "P3", "D3"]
    assert given == [None, "P1", "P2"]  # after a relay step sglang sees the prefill batch before it


def test_the_relay_runs_every_step_when_no_prefill_waits():
    ran, _ = run(StepOrder(), [], ["D1", "D2", "D3"], 3)
    assert ran == ["D1", "D2", "D3"]


def test_prefills_run_back_to_back_when_nothing_relays():
    ran, given = run(StepOrder(), ["P1", "P2", "P3"], [], 3)
    assert ran == ["P1", "P2", "P3"] and given == [None, "P1", "P2"]
