"""`txnwatch inspect`: what one partition or the coordinator log says now."""
