"""The SQLite driver: the embedded default, one file, one writer thread per process.

`mealquest.store.Store` is its store; `jobs`, `households` and `recipes` here
hold its SQL, with the same functions, signatures and meaning as the
PostgreSQL driver's modules of the same names.
"""
