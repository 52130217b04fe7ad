"""The jobs service: what the web, the CLI and the dashboard call.

`JobService` (one per app, `get_jobs`) enqueues, reads, cancels and starts
the process's pool; beside it, what a household's live view needs (`live`,
`watcher`, `standing`), and the deployment's rules for its jobs (`quota`,
`flow`, `retention`). It sits above the runner and the kind author's API
(`mealquest.jobs`), and below the web (`mealquest.jobs.web`).
"""

from mealquest.jobs.enqueueing import Enqueued, JobRequest
from mealquest.jobs.service.job_service import JobService, get_jobs, init_app
from mealquest.model.batches import Batched

__all__ = ["Batched", "Enqueued", "JobRequest", "JobService", "get_jobs", "init_app"]
