"""daisychain.server"""
