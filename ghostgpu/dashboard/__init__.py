"""The controller's Grafana dashboard: `panels` (the single list of panels and their PromQL) and
`preview` (queries a Prometheus and draws those panels into a PNG with matplotlib)."""
