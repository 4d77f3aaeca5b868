"""Against a real cluster: campaigns, the current leader, observing every change as an
iterator, proclaiming, resigning, and a leadership lost with its session."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Optional, Union

import pytest

import leasehold

pytestmark = pytest.mark.cluster

#: How long the tests wait for one observed change.
CHANGE_WAIT_S = 10.0


def next_change(observation: leasehold.Observation) -> Optional[leasehold.Leader]:
    return observation.get(timeout=CHANGE_WAIT_S)


def test_an_election_has_one_leader_and_observers_see_every_change(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("election")
    with client.observe(name) as observation, client.session(ttl=10) as a, client.session(ttl=10) as b:
        assert next_change(observation) is None, "the first state is the current one: vacant"
        assert client.leader(name) is None

        leadership = a.campaign(name, "a.example:80")
        assert leadership.is_valid() and leadership.token > 0
        seen = next_change(observation)
        assert seen == leasehold.Leader(a.id, client.client_name, leadership.token, "a.example:80")
        assert client.leader(name) == seen

        with pytest.raises(leasehold.NotElected) as raised:
            b.campaign(name, "b.example:80", wait=0.5)
        assert raised.value.leader == seen

        leadership.proclaim("a.example:81")
        assert next_change(observation) == leasehold.Leader(a.id, client.client_name, leadership.token, "a.example:81")

        outcome: "queue.Queue[Union[leasehold.Leadership, BaseException]]" = queue.Queue()

        def campaign() -> None:
            try:
                outcome.put(b.campaign(name, "b.example:80", wait=30))
            except BaseException as error:
                outcome.put(error)

        threading.Thread(target=campaign, daemon=True).start()
        leadership.resign()
        successor = outcome.get(timeout=CHANGE_WAIT_S)
        assert isinstance(successor, leasehold.Leadership) and successor.token > leadership.token
        changes = [next_change(observation)]
        if changes[0] is None:  # The resignation and the next grant may be one entry or two.
            changes.append(next_change(observation))
        assert changes[-1] == leasehold.Leader(b.id, client.client_name, successor.token, "b.example:80")
        assert not leadership.is_valid()


def test_a_leadership_ends_with_its_session(client: leasehold.Client, unique: Callable[[str], str]) -> None:
    name = unique("election")
    with client.observe(name) as observation:
        assert next_change(observation) is None
        session = client.session(ttl=10)
        leadership = session.campaign(name, "worker-1")
        observed = next_change(observation)
        assert observed is not None and observed.token == leadership.token
        session.close()
        assert leadership.wait_lost(CHANGE_WAIT_S), "the handle says the leadership ended"
        assert not leadership.is_valid()
        assert next_change(observation) is None, "observers see the vacancy"
        assert client.leader(name) is None


def test_observing_delivers_changes_in_commit_order_and_ends_when_closed(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("election")
    observation = client.observe(name)
    assert next_change(observation) is None
    with client.session(ttl=10) as session:
        leadership = session.campaign(name, "v0")
        for value in ["v1", "v2", "v3"]:
            leadership.proclaim(value)
        values = []
        while not values or values[-1] != "v3":
            state = next_change(observation)
            assert state is not None and state.token == leadership.token
            values.append(state.value)
        assert values == sorted(values) and values[0] in ("v0", "v1"), f"in commit order: {values}"
        assert len(set(values)) == len(values), "a state is not delivered twice"
    observation.close()
    with pytest.raises(StopIteration):
        next(observation)
    observation._thread.join(CHANGE_WAIT_S)
    assert not observation._thread.is_alive(), "the observing thread ends with the observation"
