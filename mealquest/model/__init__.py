"""The values every layer shares: rows as the drivers return them, and what they take.

Nothing here touches a database, a request or a greenlet: the drivers
(`mealquest.db`) build and read these, and the runner, the services and
the API pass them around.
"""
