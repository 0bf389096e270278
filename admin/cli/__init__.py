"""The admin commands: `txnwatch collect`, `inspect` and `proposals`."""
