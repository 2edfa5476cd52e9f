"""flywheel"""
