"""The benchmark's systems under test: Gristmill and the peers a user would pick instead.

``plain_app`` (FastAPI, one model call per request) and ``ray_app`` (Ray Serve with
``@serve.batch``) serve the same ``sim`` model as Gristmill's workers; ``targets`` starts and
stops each system and reads its batch counters; ``setup`` installs the peers' own virtualenv.
"""
