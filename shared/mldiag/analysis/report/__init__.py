"""The report (summary.html) and the diff page (diff.html): Python builds a view model of
plain dataclasses (`model`, `summary`, `tools`, `diff`) and the Jinja2 templates under
`mldiag/web/templates/report/` draw it, on the base, macros and stylesheet the console
shares (`page`)."""
