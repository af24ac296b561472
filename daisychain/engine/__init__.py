"""daisychain.engine"""
