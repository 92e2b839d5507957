"""The one SQLite layer under every part of gatewayscope that touches an rLLM trace store file.

* :mod:`~gatewayscope._sqlite.open`: opening the file (read-only or read-write, never creating one) and the
  StoreError sentence for each way SQLite fails on it;
* :mod:`~gatewayscope._sqlite.schema`: the gateway's tables a trace store holds, and the check that a file
  holds them;
* :mod:`~gatewayscope._sqlite.locking`: waiting for the file's lock by fine polling, seeing other processes'
  locks through SQLite's own descriptor, reads of one file taking turns, and the one way gatewayscope takes
  a write transaction on a live store;
* :mod:`~gatewayscope._sqlite.statements`: read statements bounded in time, which end early for a writer
  that waits on them;
* :mod:`~gatewayscope._sqlite.reading`: one read of a live store, its connection, probe and watch opened and
  closed together.

It knows the gateway's file and SQLite's locking, nothing of what is read or written: the rLLM source, the
tombstone guard and the session deletes build on it, and it imports none of them.
"""
