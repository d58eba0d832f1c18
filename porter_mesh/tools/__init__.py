"""Agent tool handlers: plain text in and out for the agent, AS2 activities on the wire."""
