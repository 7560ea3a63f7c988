"""The HTTP edge every route shares: the key check before any body is read
(``auth``), errors mapped to statuses and shaped for the route's clients (``http``,
``error_shapes``), body limits, the log and counts of refused requests, readiness and
the trace span."""
