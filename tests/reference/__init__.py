"""An independent reference scheduler that the scheduler's decisions are held to."""
