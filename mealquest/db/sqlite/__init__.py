"""The SQLite driver: the embedded default, one file, one writer thread per process.

`store.SqliteStore` is its store (its writes run in `writer`'s native
thread, on connections `connection` opens); `migrate` applies its
migrations; `jobs`, `households`, `recipes`, `periodic`, `retention`,
`operators`, `operations`, `processes` and `streams` hold its SQL, each a
statement set of the contract in `mealquest.db.driver`; `standing` holds
the reads of a queued job's place in line.
"""
