"""What txnwatch's two apps share around the domain: `Settings` from `TXNWATCH_*` (settings.py), the flags every
command takes (cli_options.py), `--command-config` client.properties (client_properties.py), our topics' names and
how they are created (topics.py), the metrics both endpoints export (metric_descriptors.py), the probes' WSGI glue
(probes.py), log redaction (redaction.py) and the jars folder (jars.py).

admin/ and streaming/ import it; it imports the domain (detectors/) and neither app (import-linter, `make lint`).
"""
