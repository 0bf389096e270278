"""The collector service: the sweep, the coordinator fallback, publishing, metrics, sightings."""
