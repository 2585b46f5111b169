"""Control of the engines behind the proxy: weight updates (the hold), replicas, admin, expiry."""
