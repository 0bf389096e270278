"""Acting on candidates: list, show, the verified abort and commit, watch."""
