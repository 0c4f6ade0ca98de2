"""What the stream server's client and server both speak, and nothing else.

- :mod:`.link` -- a session: a handshake connection (sealed with AES-GCM when asked), adapted to
  the client's deadlines (``ClientLink``) and the server loop's non-blocking calls (``ServerLink``,
  ``ServerListener``);
- :mod:`.protocol` -- the control protocol: requests, replies, events, replay data, and the
  schema of every operation's arguments (``SCHEMAS``);
- :mod:`.chunking` -- messages above the transport's limit, split and reassembled;
- :mod:`.replay` -- :class:`~.replay.ReplayBlock`, what a replay yields;
- :mod:`.records` -- the part-file record format of sink staging (server and local stage);
- :mod:`.settings` -- :class:`~.settings.ClientSettings`, how to reach a server;
- :mod:`.call` -- one request and its reply on a session of its own (``aeron-spark stat``).

The client (``connector.client``) and the server (``connector.server``) import this package,
never each other; the payload formats and the options import only this of the two.
"""

from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.session.settings import DEFAULT_ENDPOINT, ClientSettings

__all__ = ["DEFAULT_ENDPOINT", "ClientSettings", "ReplayBlock"]
