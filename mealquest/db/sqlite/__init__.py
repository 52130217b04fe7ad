"""The SQLite driver: the embedded default, one file, one writer thread per process.

`store.SqliteStore` is its store (its writes run in `writer`'s native
thread, on connections `connection` opens); `migrate` applies its
migrations; `jobs`, `households`, `recipes`, `periodic`, `retention`,
`operators` and `operations` hold its SQL, each a statement set of the
contract in `mealquest.db.driver`.
"""
