"""What operators do across households, each action audited: suspending,
resuming and erasing a household, and acting on every job a filter matches.

Used by the dashboard and the CLI alike; every action records itself in the
audit log (`mealquest.audit`), in the same transaction as its change, or
batch by batch for those done in batches.
"""
