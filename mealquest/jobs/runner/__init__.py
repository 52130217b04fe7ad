"""The engine: one process's pool of workers and the roles it is made of.

`pool.Pool` puts the roles together and supervises them; each role is a
module of its own (`producer`, `executor`, `completer`, `heartbeat`,
`watchdog`, `rescuer`, `unhandled`, `scheduler`, `hub_monitor`) that
imports no other role. What they share is data, not behaviour: the
`running.Running` record of a job, the `slots.Slots` ledger and the
`settings.PoolSettings`.
"""
