"""remediate"""
