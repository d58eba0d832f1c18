"""The mesh node: an asyncio core and a synchronous facade over it."""
