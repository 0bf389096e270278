"""What txnwatch's two apps share around the domain: settings (settings.py), the common flags (cli_options.py),
client.properties (client_properties.py), our topics (topics.py), the exported metrics (metric_descriptors.py),
the probes' WSGI glue (probes.py), log redaction (redaction.py) and the jars folder (jars.py). admin/ and
streaming/ import it; it imports the domain (detectors/) and neither app (import-linter, `make lint`).
"""
