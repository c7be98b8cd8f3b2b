"""Reading finished runs back: bottlenecks, trade-off curves, time- and cost-to-accuracy reports."""
