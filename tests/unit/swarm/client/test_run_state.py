"""What ``SwarmClient.run``'s workers share (``swarm.client._run_state``) and the server's errors as the
client raises them (``swarm.client._errors``), in process: tasks grouped and claimed in data order,
held-out rounds only at multiples of ``eval_every``, a broken task stream ending the run with its error,
and one error shape parsed into ``SwarmHTTPError``."""

from __future__ import annotations

import httpx
import pytest

from swarm.client import SwarmHTTPError
from swarm.client._errors import http_error_from
from swarm.client._run_state import RunState, check_heldout, episode_items


def test_each_task_becomes_a_group_of_episodes_and_groups_open_in_data_order() -> None:
    tasks = [{"task_id": "t1", "prompt": "a"}, {"task_id": "t2", "prompt": "b"}]
    state = RunState(episode_items(tasks, group_size=2), limit=3, heldout=[], eval_every=0)
    items = [state.next_item() for _ in range(4)]
    assert items[3] is None and state.started == 3  # the limit counts episodes, not tasks
    first, second = items[0][1], items[2][1]
    assert items[1][1] == first != second and first.startswith("t1:") and second.startswith("t2:")
    opened, is_first, before = state.group_turn(first, 2)
    assert is_first and before is None  # the first group waits for nobody
    _, is_first, before = state.group_turn(second, 2)
    assert is_first and before is opened  # the second group's first claim waits for the first group's
    assert state.group_turn(first, 2)[1] is False  # a later member of a group is not its first claim


def test_held_out_rounds_fall_on_multiples_of_eval_every_only() -> None:
    state = RunState(iter(()), limit=None, heldout=[{"task_id": "h1"}], eval_every=5)
    assert state.eval_due(0)  # the first round, at step 0
    assert not state.eval_due(1)  # one round at a time
    state.eval_busy = False  # the round ended
    assert not state.eval_due(3) and not state.eval_due(7)  # 7 passed 5 without a round: wait for 10
    assert state.eval_due(10) and state.next_eval == 15


def test_a_broken_task_stream_ends_the_run_with_its_error() -> None:
    def tasks():
        yield {"task_id": "t1"}
        raise RuntimeError("the dataset file went away")

    state = RunState(episode_items(tasks(), group_size=1), limit=None, heldout=[], eval_every=0)
    assert state.next_item() is not None and state.next_item() is None
    assert state.stop and str(state.fatal) == "the dataset file went away"
    with pytest.raises(ValueError, match="non-empty string 'task_id'"):
        next(episode_items([{"prompt": "no id"}], group_size=1))
    with pytest.raises(ValueError, match="held-out task_id 'h' appears twice"):
        check_heldout([{"task_id": "h"}, {"task_id": "h"}])


def test_the_servers_error_shape_becomes_a_swarm_http_error() -> None:
    request = httpx.Request("POST", "http://server/api/v1/episodes")
    body = {"error": {"code": "retry_later", "message": "the queue is full", "detail": {"rows": 9}, "retry_after": 2}}
    error = http_error_from(httpx.Response(429, json=body, request=request))
    assert isinstance(error, SwarmHTTPError)
    assert (error.status, error.code, error.message, error.detail, error.retry_after) == (
        429, "retry_later", "the queue is full", {"rows": 9}, 2.0)
    other = http_error_from(httpx.Response(502, text="<html>bad gateway</html>", request=request))
    assert (other.status, other.code, other.message) == (502, "unknown", "<html>bad gateway</html>")
