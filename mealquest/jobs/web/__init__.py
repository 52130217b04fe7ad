"""The jobs' HTTP face: `/api/v1/jobs` and `/api/v1/batches`, their shapes,
their event streams and long polls, and what routes that enqueue share."""
