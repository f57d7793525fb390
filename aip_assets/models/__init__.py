"""Connections to language models: one async client for every role.

- ``client``: ``ModelClient``, composing the journal's cache, a provider and the journal's record;
  the endpoint check and the structured-output negotiation;
- ``provider``: the ``Provider`` protocol, its ``Capabilities`` and ``provider_for(conn)``;
  providers in ``openai_compatible`` (HTTP), ``builtin`` (the offline model) and ``batch``
  (the Batch API; ``builtin_batch`` serves it for the builtin model);
- ``request`` (body and key), ``result`` (``ChatResult``), ``retry`` (retries and Retry-After),
  ``deadline`` (the row deadline), ``budget`` (the run's caps), ``concurrency`` (adaptive calls in
  flight), ``slots`` (the endpoint's connections on this machine), ``ratelimit`` (its shared
  rates), ``journal`` (the call journal), ``shared_state`` (Postgres for shared mode),
  ``structured`` (structured-output forms).
"""
