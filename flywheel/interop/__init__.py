"""Interop with other formats: demo imports (OSWorld results, AgentNet, slime) and Hub exports (no Prefect)."""
