"""A subscription added while the receiver removes a finished one on the same stream is kept.

``ReceiveDispatcher.add`` runs on the thread adding a subscription, the removal of closed
interests in ``do_work`` on the receiver's thread. With sockets shared by port (issue 19: a
client's session subscriptions share its reply subscription's socket), both can touch one
stream's interests at once. The interleaving is made deterministic here: the receiver's elicit
SM goes through ``transmit``, which adds the new interest in the middle of ``do_work``, where
another thread's ``add`` could run.
"""

from __future__ import annotations

from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest

STREAM = 7


def test_an_interest_added_during_the_removal_of_a_closed_one_is_kept() -> None:
    dispatcher = ReceiveDispatcher()
    eliciting = StreamInterest(STREAM, control_address=("127.0.0.1", 40001))
    finished = StreamInterest(STREAM, session_id=5)
    dispatcher.add(eliciting)
    dispatcher.add(finished)
    dispatcher.remove(finished, 0)  # closed, no images: removed by the next do_work
    added = StreamInterest(STREAM, session_id=6)
    sent: list[object] = []

    def transmit(data: bytes, address: object) -> None:
        sent.append(address)
        if len(sent) == 1:
            dispatcher.add(added)  # another thread adding a subscription, right now

    dispatcher.do_work(1, transmit)
    assert sent, "the eliciting interest sent its SM (the interleaving happened)"
    assert dispatcher.interests[STREAM] == (eliciting, added)


def test_the_last_closed_interest_of_a_stream_takes_the_stream_away() -> None:
    dispatcher = ReceiveDispatcher()
    only = StreamInterest(STREAM)
    dispatcher.add(only)
    dispatcher.remove(only, 0)
    dispatcher.do_work(1, lambda data, address: None)
    assert STREAM not in dispatcher.interests and not dispatcher.has_interests()
