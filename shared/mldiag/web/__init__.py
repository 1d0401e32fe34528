"""What the report and the console share: one stylesheet (`static/mldiag.css`) and the
console's Jinja2 templates (`templates/`, autoescaped)."""
