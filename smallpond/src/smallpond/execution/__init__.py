"""Execution: tasks, executors (local process pool, Ray), driver, progress and reports."""
