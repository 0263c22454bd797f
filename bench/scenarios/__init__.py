"""One module per scenario: converge, latency, burst, cost (memory), relist."""
