"""The PostgreSQL driver: its store, its SQL and its migrations."""
