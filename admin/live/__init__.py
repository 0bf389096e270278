"""Evidence read from the cluster now, for the proposals and inspect."""
