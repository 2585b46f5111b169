"""Control of the engines behind the proxy: weight updates, pause gates, replicas, admin, expiry."""
