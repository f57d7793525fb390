"""Connections to language models: one async client for every role.

- ``client``: ``ModelClient``, composing the journal's cache, a provider and the journal's record,
  and the structured-output negotiation; ``client_forms`` (the form a client asks for JSON in);
  ``endpoint_check`` (the endpoint check before a run);
- ``provider``: the ``Provider`` protocol and its ``Capabilities``; ``providers``: ``provider_for(conn)``;
  providers in ``openai_compatible`` (HTTP), ``builtin`` (the offline model) and ``batch_provider``
  (the Batch API; ``batch`` is the client's runner of it; ``builtin_batch`` serves it for the builtin model);
- ``request`` (body and key), ``result`` (``ChatResult``), ``retry`` (retries and Retry-After),
  ``deadline`` (the row deadline), ``budget`` (the run's caps), ``concurrency`` (adaptive calls in
  flight), ``slots`` (the endpoint's connections on this machine), ``ratelimit`` (its shared
  rates), ``journal`` (the call journal; ``journal_format``: its stored form; ``journal_pg``: in
  Postgres), ``structured`` (structured-output forms); shared mode's Postgres state is
  ``aip_assets.shared_state``, outside this package.
"""
